//! The hybrid model: embeddings, the stack of GDN / gated-attention decoder layers with dense or
//! MoE feed-forward blocks, the final norm and the LM head (model-spec §5.4). Pure compute over
//! an explicit [`SequenceState`]: it knows nothing of text, sampling or budgets.

use std::time::Instant;

use super::attention::AttnLayer;
use super::config::{Family, LayerKind, MlpKind, ModelConfig};
use super::cpu::awake;
use super::cpu::tensor::{F32_BYTES, Linear, Mat, Precision};
use super::finite::{self, Sublayer};
use super::gdn::GdnLayer;
use super::load::{LoadCounts, LoadProgress, Loader};
use super::mlp::{DenseMlp, Mlp, MoeBlock};
use super::norm::RmsNorm;
use super::rope::Rope;
use super::state::{LayerState, SequenceState};
use super::trace::{LayerTrace, StateTrace};
use super::weights::WeightStore;
use crate::checkpoint::ModelSource;
use crate::error::{Error, Result};

pub(crate) enum Mixer {
    Linear(GdnLayer),
    Attention(AttnLayer),
}

/// One decoder layer: pre-norm token mixer and pre-norm feed-forward, each with a residual.
pub struct DecoderLayer {
    pub(crate) input_norm: RmsNorm,
    pub(crate) mixer: Mixer,
    pub(crate) post_norm: RmsNorm,
    pub(crate) mlp: Mlp,
}

impl DecoderLayer {
    fn weight_bytes(&self) -> usize {
        let m = match &self.mixer {
            Mixer::Linear(g) => g.weight_bytes(),
            Mixer::Attention(a) => a.weight_bytes(),
        };
        m + self.mlp.weight_bytes() + (self.input_norm.dim() + self.post_norm.dim()) * F32_BYTES
    }
}

/// The checkpoint's MTP module (model-spec §6), loaded when the files carry `mtp.*` tensors.
pub struct MtpModule {
    pub fc: Linear,
    pub pre_fc_norm_embedding: RmsNorm,
    pub pre_fc_norm_hidden: RmsNorm,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

/// The MTP module's own state: the KV cache of its attention layer(s). Entry `p` is built from
/// `(x_{p+1}, h_p)`, so it trails the main model's state by one position.
#[derive(Debug, Clone, PartialEq)]
pub struct MtpState {
    pub position: usize,
    pub layers: Vec<LayerState>,
}

impl MtpState {
    /// Drops the entries at positions `len..` (chained draft steps, rewritten next round).
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            if let LayerState::Attention(kv) = l {
                kv.truncate(len);
            }
        }
        self.position = self.position.min(len);
    }

    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| if let LayerState::Attention(kv) = l { kv.bytes() } else { 0 }).sum()
    }
}

/// What one MTP pass returns.
pub struct MtpOutput {
    /// Draft logits per requested row (predicting the token after the input token).
    pub logits: Mat,
    /// The module's post-`mtp.norm` hidden state of every row (the input of a chained step).
    pub hidden: Mat,
}

impl MtpModule {
    fn weight_bytes(&self) -> usize {
        self.fc.weight_bytes()
            + self.layers.iter().map(DecoderLayer::weight_bytes).sum::<usize>()
            + (3 * self.norm.dim()) * F32_BYTES
    }
}

/// Which positions get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsRows {
    Last,
    All,
}

#[derive(Debug, Clone, Copy)]
pub struct ForwardOptions {
    pub logits: LogitsRows,
    /// Record the L2 norm of every position's hidden state after each layer and the final norm.
    pub hidden_norms: bool,
    /// Speculative verification: GDN layers run every token through the recurrent rule (the
    /// arithmetic of one-token decoding, so verified tokens are bit-identical to decoded ones) and
    /// keep a tape; [`SequenceState::accept`] then keeps a prefix.
    pub verify: bool,
    /// Check every sublayer's output for NaN / ±Inf and fail with [`Error::NonFinite`] naming
    /// the first (on by default: one pass over the activations per sublayer, see
    /// [`super::finite`]).
    pub check_finite: bool,
    /// Return a [`StateTrace`]: what every GDN layer's pass did to its state (β, g, ‖S‖,
    /// ‖ΔS‖, non-finite entries per head) and every attention layer's KV length.
    pub trace_state: bool,
}

impl Default for ForwardOptions {
    fn default() -> Self {
        ForwardOptions {
            logits: LogitsRows::Last,
            hidden_norms: false,
            verify: false,
            check_finite: true,
            trace_state: false,
        }
    }
}

/// What `run_layer` checks for non-finite values: the layer's index and the tokens of its rows.
#[derive(Clone, Copy)]
struct FiniteCheck<'a> {
    layer: usize,
    ids: &'a [u32],
}

/// One layer's output over the positions of a forward pass: where two engines, two builds or
/// a broken checkpoint part ways shows in these first (`logits --layers`, the reference test).
#[derive(Debug, Clone, PartialEq)]
pub struct HiddenStats {
    /// The L2 norm of every position's hidden state.
    pub norms: Vec<f32>,
    /// The largest |x| among the finite values.
    pub max_abs: f32,
    /// NaN and ±Inf values.
    pub nonfinite: usize,
}

impl HiddenStats {
    fn of(m: &Mat) -> HiddenStats {
        let mut max_abs = 0f32;
        let mut nonfinite = 0;
        let norms = (0..m.rows)
            .map(|r| {
                let row = m.row(r);
                for &x in row {
                    if x.is_finite() {
                        max_abs = max_abs.max(x.abs());
                    } else {
                        nonfinite += 1;
                    }
                }
                row.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt() as f32
            })
            .collect();
        HiddenStats { norms, max_abs, nonfinite }
    }

    /// The mean of the positions' norms (NaN when any is).
    pub fn mean_norm(&self) -> f32 {
        (self.norms.iter().map(|&n| n as f64).sum::<f64>() / self.norms.len().max(1) as f64) as f32
    }
}

pub struct ForwardOutput {
    /// One row per requested position, `vocab_size` columns.
    pub logits: Mat,
    /// What each layer's output held (the layers, then the final norm), when requested.
    pub hidden_norms: Option<Vec<HiddenStats>>,
    /// Post-final-norm hidden states of every position of this call (the MTP head's input).
    pub hidden: Mat,
    /// What the pass did to the state, when asked ([`ForwardOptions::trace_state`]).
    pub state_trace: Option<StateTrace>,
}

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub precision: Precision,
    /// Skip the `mtp.*` tensors even when present.
    pub skip_mtp: bool,
    pub progress: Option<LoadProgress>,
}

pub struct Model {
    pub(crate) config: ModelConfig,
    pub(crate) precision: Precision,
    pub(crate) source: ModelSource,
    pub(crate) embed: Linear,
    /// `None` when tied to the embedding.
    pub(crate) lm_head: Option<Linear>,
    pub(crate) layers: Vec<DecoderLayer>,
    pub(crate) norm: RmsNorm,
    rope: Rope,
    pub(crate) mtp: Option<MtpModule>,
    /// Where the LM tensors live (`model.language_model.` or `model.`).
    pub(crate) lm_prefix: String,
    pub(crate) stored_bytes: usize,
    pub(crate) stored_dtypes: Vec<String>,
    /// Bytes of weights that are views into the mapped checkpoint (no copy in memory).
    pub(crate) mapped_bytes: usize,
    /// Weights held as FP8 codes (a byte each), MTP included.
    pub(crate) fp8_weights: usize,
    pub(crate) load_seconds: f64,
}

/// One decoder layer's weights under `ld` (`….layers.{i}.` or `mtp.layers.{i}.`).
fn load_layer(ld: &Loader, cfg: &ModelConfig, kind: LayerKind, mlp: MlpKind) -> Result<DecoderLayer> {
    let h = cfg.hidden_size;
    let eps = cfg.rms_norm_eps;
    let mixer = match kind {
        LayerKind::LinearAttention => Mixer::Linear(GdnLayer::load(cfg, &ld.pp("linear_attn"))?),
        LayerKind::FullAttention => Mixer::Attention(AttnLayer::load(cfg, &ld.pp("self_attn"))?),
    };
    let mlp = match mlp {
        MlpKind::Dense => {
            let inter =
                cfg.intermediate_size.ok_or_else(|| Error::Compute("dense MLP without intermediate_size".into()))?;
            Mlp::Dense(DenseMlp::load(&ld.pp("mlp"), h, inter)?)
        }
        MlpKind::Moe => {
            let m = cfg.moe.as_ref().ok_or_else(|| Error::Compute("MoE layer without MoE config".into()))?;
            Mlp::Moe(MoeBlock::load(m, h, &ld.pp("mlp"))?)
        }
    };
    Ok(DecoderLayer {
        input_norm: RmsNorm::zero_centred(&ld.get("input_layernorm.weight", &[h])?, eps),
        mixer,
        post_norm: RmsNorm::zero_centred(&ld.get("post_attention_layernorm.weight", &[h])?, eps),
        mlp,
    })
}

/// The MTP tensors a checkpoint that has some `mtp.*` tensors lacks, judged from the model's
/// own full-attention layers (an MTP layer is built like one, with the same feed-forward kind):
/// for `inspect`, which reads no weights. Empty when there is no `mtp.*` tensor at all.
pub fn missing_mtp_tensors(store: &WeightStore, config: &ModelConfig) -> Vec<String> {
    let have: std::collections::HashSet<&str> = store.names().collect();
    if !have.iter().any(|n| n.starts_with("mtp.")) {
        return vec![];
    }
    let prefix = ["model.language_model.", "model."]
        .into_iter()
        .find(|p| have.contains(format!("{p}embed_tokens.weight").as_str()))
        .unwrap_or("model.");
    let mlp_kind = if config.family == Family::Qwen35 { MlpKind::Dense } else { MlpKind::Moe };
    let like = (0..config.num_hidden_layers)
        .find(|&i| config.layer_types[i] == LayerKind::FullAttention && config.mlp_kinds[i] == mlp_kind);
    let mut want: Vec<String> =
        ["fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"]
            .iter()
            .map(|n| format!("mtp.{n}"))
            .collect();
    if let Some(j) = like {
        let layer = format!("{prefix}layers.{j}.");
        let suffixes: Vec<&str> = have.iter().filter_map(|n| n.strip_prefix(layer.as_str())).collect();
        for i in 0..config.mtp_num_hidden_layers.max(1) {
            want.extend(suffixes.iter().map(|s| format!("mtp.layers.{i}.{s}")));
        }
    }
    want.sort();
    want.into_iter().filter(|n| !have.contains(n.as_str())).collect()
}

impl Model {
    /// The checkpoint's configuration (config.json, checked).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Where the weights came from.
    pub fn source(&self) -> &ModelSource {
        &self.source
    }

    /// The MTP head, when the checkpoint has one and it was loaded.
    pub fn mtp(&self) -> Option<&MtpModule> {
        self.mtp.as_ref()
    }

    /// Where the LM tensors live (`model.language_model.` or `model.`).
    pub fn lm_prefix(&self) -> &str {
        &self.lm_prefix
    }

    pub fn stored_bytes(&self) -> usize {
        self.stored_bytes
    }

    pub fn stored_dtypes(&self) -> &[String] {
        &self.stored_dtypes
    }

    /// Bytes of weights that are views into the mapped checkpoint (no copy in memory).
    pub fn mapped_bytes(&self) -> usize {
        self.mapped_bytes
    }

    /// Weights held as FP8 codes (a byte each), MTP included.
    pub fn fp8_weights(&self) -> usize {
        self.fp8_weights
    }

    pub fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    /// The first rows of the embedding rounded to bf16, hashed (FNV-1a, 64 bits): the same
    /// for every copy of these weights at bf16 or wider (a bf16 checkpoint and its f32 upcast),
    /// different for other weights. Compared to tell two engines' models apart.
    pub fn embedding_fingerprint(&self) -> String {
        let bits: Vec<u8> = (0..self.embed.out_features.min(8))
            .flat_map(|r| self.embed.row(r).unwrap_or_default())
            .flat_map(|v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        format!("{:016x}", crate::hash::fnv1a(&[&bits]))
    }

    pub fn load(source: &ModelSource, opts: &LoadOptions) -> Result<Self> {
        let started = Instant::now();
        let config = super::config::read_config(source)?;
        let mut store = WeightStore::open(source)?;
        store.expect_fp8(config.quantization.clone());
        store.prefetch();
        let (v, h) = (config.vocab_size, config.hidden_size);

        let expected_prefix = if config.nested { "model.language_model." } else { "model." };
        let lm_prefix = ["model.language_model.", "model."]
            .into_iter()
            .find(|p| store.contains(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| Error::MissingTensor {
                name: format!("{expected_prefix}embed_tokens.weight"),
                searched: format!("{} ({} tensors)", source.label(), store.names().count()),
            })?
            .to_string();
        let p = &lm_prefix;
        // What will be read: the language model, its head, and the MTP module unless skipped.
        let total = store.bytes_where(|n| {
            n.starts_with(p.as_str()) || n == "lm_head.weight" || (!opts.skip_mtp && n.starts_with("mtp."))
        }) as u64;
        let counts = LoadCounts { total, ..Default::default() };
        let ld = Loader::new(&store, opts.precision, opts.progress.as_ref(), &counts);
        let lm = ld.pp(p.trim_end_matches('.'));
        let embed = lm.linear("embed_tokens.weight", v, h)?;
        let lm_head = if store.contains("lm_head.weight") {
            Some(ld.linear("lm_head.weight", v, h)?)
        } else if config.tie_word_embeddings {
            None
        } else {
            return Err(Error::MissingTensor {
                name: "lm_head.weight".into(),
                searched: format!(
                    "{} (tie_word_embeddings is false, so the checkpoint must carry its own LM head)",
                    source.label()
                ),
            });
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                load_layer(&lm.pp(format_args!("layers.{i}")), &config, config.layer_types[i], config.mlp_kinds[i])
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::zero_centred(&lm.get("norm.weight", &[h])?, config.rms_norm_eps);

        // Any mtp.* tensor means the checkpoint meant to carry the head: an incomplete set is an
        // error naming what is missing, not a head silently absent.
        let mtp_count = store.names().filter(|n| n.starts_with("mtp.")).count();
        let mtp = if !opts.skip_mtp && mtp_count > 0 {
            let n = config.mtp_num_hidden_layers.max(1);
            let eps = config.rms_norm_eps;
            let mlp_kind = if config.family == Family::Qwen35 { MlpKind::Dense } else { MlpKind::Moe };
            let ld = ld.pp("mtp");
            let module = || -> Result<MtpModule> {
                Ok(MtpModule {
                    fc: ld.linear("fc.weight", h, 2 * h)?,
                    pre_fc_norm_embedding: RmsNorm::zero_centred(&ld.get("pre_fc_norm_embedding.weight", &[h])?, eps),
                    pre_fc_norm_hidden: RmsNorm::zero_centred(&ld.get("pre_fc_norm_hidden.weight", &[h])?, eps),
                    layers: (0..n)
                        .map(|i| {
                            load_layer(&ld.pp(format_args!("layers.{i}")), &config, LayerKind::FullAttention, mlp_kind)
                        })
                        .collect::<Result<Vec<_>>>()?,
                    norm: RmsNorm::zero_centred(&ld.get("norm.weight", &[h])?, eps),
                })
            };
            Some(module().map_err(|e| match e {
                Error::MissingTensor { name, searched } => Error::MissingTensor {
                    name,
                    searched: format!(
                        "{searched}; the checkpoint has {mtp_count} other mtp.* tensors, so its MTP head is incomplete"
                    ),
                },
                e => e,
            })?)
        } else {
            None
        };
        let unused = store
            .names()
            .filter(|n| {
                !n.starts_with(p.as_str())
                    && !n.starts_with("model.visual.")
                    && !n.starts_with("mtp.")
                    && *n != "lm_head.weight"
            })
            .count();
        if unused > 0 {
            tracing::warn!("{unused} tensors in {} are outside the language model and were not loaded", source.label());
        }
        Ok(Model {
            rope: Rope::new(&config.rope),
            precision: opts.precision,
            source: source.clone(),
            embed,
            lm_head,
            layers,
            norm,
            mtp,
            lm_prefix,
            stored_bytes: store.stored_bytes(),
            stored_dtypes: store.dtype_names(),
            mapped_bytes: counts.mapped.get() as usize,
            fp8_weights: counts.fp8.get() as usize,
            load_seconds: started.elapsed().as_secs_f64(),
            config,
        })
    }

    pub fn new_state(&self) -> SequenceState {
        SequenceState::new(&self.config)
    }

    /// The LM head shares the embedding matrix.
    pub fn tied_embeddings(&self) -> bool {
        self.lm_head.is_none()
    }

    /// Bytes the loaded weights occupy in memory (as stored, or bf16 with the bf16 reference's
    /// cast points), MTP included.
    pub fn weight_bytes(&self) -> usize {
        let head = self.lm_head.as_ref().map(Linear::weight_bytes).unwrap_or(0);
        self.embed.weight_bytes()
            + head
            + self.layers.iter().map(DecoderLayer::weight_bytes).sum::<usize>()
            + self.norm.dim() * F32_BYTES
            + self.mtp.as_ref().map(MtpModule::weight_bytes).unwrap_or(0)
    }

    /// What is held and how, in one line: "1.51 GB bf16, 1.50 GB of it mapped from the
    /// checkpoint (no copy) · loaded in 0.05 s".
    pub fn storage_summary(&self) -> String {
        let gb = |b: usize| format!("{:.2} GB", b as f64 / 1e9);
        let dtypes = self.stored_dtypes.join("/").to_lowercase();
        // At bf16 everything is held as bf16, except FP8, which stays FP8.
        let held = match (self.precision, self.config.quantization.is_some()) {
            (Precision::Bf16, true) => "fp8/bf16".to_string(),
            (Precision::Bf16, false) => "bf16".to_string(),
            _ => dtypes,
        };
        format!(
            "weights {} {held}, {} of it mapped from the checkpoint (no copy) · loaded in {:.2} s",
            gb(self.weight_bytes()),
            gb(self.mapped_bytes),
            self.load_seconds
        )
    }

    /// A fresh MTP state, when the checkpoint has an MTP module.
    pub fn new_mtp_state(&self) -> Option<MtpState> {
        let row = self.config.num_key_value_heads * self.config.head_dim;
        self.mtp.as_ref().map(|m| MtpState {
            position: 0,
            layers: m.layers.iter().map(|_| LayerState::Attention(super::state::KvCache::new(row))).collect(),
        })
    }

    /// One MTP pass (model-spec §6.1): row `i` combines the embedding of `next_ids[i]` with the
    /// main model's post-norm hidden state `hidden.row(i)` at position `state.position + i`, and
    /// predicts the token after `next_ids[i]`. Appends to the MTP KV cache.
    pub fn mtp_forward(
        &self,
        next_ids: &[u32],
        hidden: &Mat,
        state: &mut MtpState,
        rows: LogitsRows,
    ) -> Result<MtpOutput> {
        let mtp = self
            .mtp
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("this checkpoint has no MTP module (no mtp.* tensors)".into()))?;
        if next_ids.len() != hidden.rows || next_ids.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "MTP needs one hidden row per token ({} tokens, {} rows)",
                next_ids.len(),
                hidden.rows
            )));
        }
        for (i, &id) in next_ids.iter().enumerate() {
            if id as usize >= self.config.vocab_size {
                return Err(Error::TokenOutOfRange {
                    id,
                    position: state.position + i,
                    vocab_size: self.config.vocab_size,
                });
            }
        }
        let prec = self.precision;
        let h = self.config.hidden_size;
        let e = mtp.pre_fc_norm_embedding.forward(&self.embed_rows(next_ids)?, prec);
        let hn = mtp.pre_fc_norm_hidden.forward(hidden, prec);
        // Embedding first, hidden second (vLLM / SGLang order).
        let mut cat = Mat::zeros(next_ids.len(), 2 * h);
        for r in 0..cat.rows {
            let row = cat.row_mut(r);
            row[..h].copy_from_slice(e.row(r));
            row[h..].copy_from_slice(hn.row(r));
        }
        let mut u = mtp.fc.forward(&cat, prec)?;
        let pos0 = state.position;
        for (layer, ls) in mtp.layers.iter().zip(state.layers.iter_mut()) {
            // A MoE router inside the MTP layer reports its row: name the head instead.
            u = self
                .run_layer(layer, u, ls, pos0, false, None, &mut None)
                .map_err(|e| finite::place(e, pos0, next_ids, |nf| nf.sublayer = Sublayer::MtpHead))?;
        }
        state.position += next_ids.len();
        let out = mtp.norm.forward(&u, prec);
        let logits = match rows {
            LogitsRows::All => self.logits_of(&out)?,
            LogitsRows::Last => self.logits_of(&out.gather_rows(&[out.rows - 1]))?,
        };
        // Drafts only propose tokens, so one check of what the head produced is enough to name
        // it (the MTP module's sublayers are not told apart).
        let base = next_ids.len() - logits.rows;
        finite::check(&logits, None, Sublayer::MtpHead, pos0 + base, &next_ids[base..])?;
        Ok(MtpOutput { logits, hidden: out })
    }

    /// Checks token ids and context length before anything is computed.
    pub fn validate(&self, ids: &[u32], state: &SequenceState) -> Result<()> {
        validate_ids(&self.config, ids, state.position)
    }

    fn embed_rows(&self, ids: &[u32]) -> Result<Mat> {
        let h = self.config.hidden_size;
        let mut data = Vec::with_capacity(ids.len() * h);
        for &id in ids {
            data.extend(self.embed.row(id as usize)?);
        }
        Ok(Mat::from_vec(ids.len(), h, data))
    }

    #[allow(clippy::too_many_arguments)]
    fn run_layer(
        &self,
        layer: &DecoderLayer,
        x: Mat,
        state: &mut LayerState,
        pos0: usize,
        verify: bool,
        check: Option<FiniteCheck>,
        traces: &mut Option<Vec<LayerTrace>>,
    ) -> Result<Mat> {
        let prec = self.precision;
        let trace = traces.is_some();
        let checked =
            |m: &Mat, sub: Sublayer| check.map_or(Ok(()), |c| finite::check(m, Some(c.layer), sub, pos0, c.ids));
        let n = layer.input_norm.forward(&x, prec);
        checked(&n, Sublayer::InputNorm)?;
        let (mixed, sub, traced) = match (&layer.mixer, &mut *state) {
            (Mixer::Linear(g), LayerState::Linear(s)) => {
                let (m, t) = g.forward_traced(&n, s, prec, verify, trace)?;
                (m, Sublayer::Gdn, t.map(LayerTrace::Gdn))
            }
            (Mixer::Attention(a), LayerState::Attention(kv)) => {
                let m = a.forward(&n, pos0, kv, &self.rope, prec)?;
                let t = trace.then(|| LayerTrace::Attention { kv_len: kv.len(), kv_bytes: kv.bytes() });
                (m, Sublayer::Attention, t)
            }
            _ => return Err(Error::State("the state does not match the model's layer plan".into())),
        };
        // Kept before the checks: a pass that goes non-finite here still shows what this
        // layer's heads did (the finite ones and the ✖ ones).
        if let (Some(ts), Some(t)) = (traces.as_mut(), traced) {
            ts.push(t);
        }
        checked(&mixed, sub).map_err(|e| match (e, &layer.mixer, &*state) {
            // Name the value head whose recurrent state went first (a NaN there spreads to every
            // head through out_proj).
            (Error::NonFinite(mut nf), Mixer::Linear(g), LayerState::Linear(s)) => {
                nf.state_head = s.first_nonfinite_head(g.cfg.num_value_heads);
                Error::NonFinite(nf)
            }
            (e, ..) => e,
        })?;
        let mut h = x;
        h.for_rows(|t, row| row.iter_mut().zip(mixed.row(t)).for_each(|(a, b)| *a = prec.round(*a + b)));
        let n = layer.post_norm.forward(&h, prec);
        checked(&n, Sublayer::PostNorm)?;
        let m = layer.mlp.forward(&n, prec).map_err(|e| match check {
            Some(c) => finite::place(e, pos0, c.ids, |nf| nf.layer = Some(c.layer)),
            None => e,
        })?;
        checked(&m, Sublayer::Mlp)?;
        h.for_rows(|t, row| row.iter_mut().zip(m.row(t)).for_each(|(a, b)| *a = prec.round(*a + b)));
        Ok(h)
    }

    /// Logits of the given rows of post-norm hidden states.
    pub fn logits_of(&self, hidden: &Mat) -> Result<Mat> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        head.forward(hidden, self.precision)
    }

    /// Runs `ids` (at positions `state.position..`) through the model, advancing `state`.
    pub fn forward(&self, ids: &[u32], state: &mut SequenceState, opts: ForwardOptions) -> Result<ForwardOutput> {
        // The pass runs on one of the pool's threads, so each layer's parallel loop starts on a
        // worker that takes part in it: called from outside the pool, every one of the ~100
        // loops of a decode step was injected into the pool while this thread slept, a wake-up
        // and a sleep each (decode 13.1 → 13.9 tok/s at bf16 and 6.5 → 7.1 at f32 on the 0.8B
        // shape, 2 cores). The other workers spin for its jobs until it ends ([`awake`]).
        awake::run(|| self.forward_on_pool(ids, state, opts))
    }

    fn forward_on_pool(&self, ids: &[u32], state: &mut SequenceState, opts: ForwardOptions) -> Result<ForwardOutput> {
        if ids.is_empty() {
            return Err(Error::InvalidArgument("forward needs at least one token".into()));
        }
        self.validate(ids, state)?;
        if state.layers.len() != self.layers.len() {
            return Err(Error::State(format!(
                "state has {} layers, the model {}",
                state.layers.len(),
                self.layers.len()
            )));
        }
        let pos0 = state.position;
        let check = opts.check_finite;
        let mut h = self.embed_rows(ids)?;
        if check {
            finite::check(&h, None, Sublayer::Embedding, pos0, ids)?;
        }
        let mut norms = opts.hidden_norms.then(Vec::new);
        let mut traces = opts.trace_state.then(Vec::new);
        // A pass that goes non-finite keeps the trace of the layers it ran in the state
        // ([`SequenceState::take_failed_trace`]): where it went wrong stays visible.
        let keep_failed = |e: Error, traces: &mut Option<Vec<LayerTrace>>, state: &mut SequenceState| {
            if let (Error::NonFinite(_), Some(layers)) = (&e, traces.take().filter(|t| !t.is_empty())) {
                state.failed_trace = Some(StateTrace { layers });
            }
            e
        };
        for i in 0..self.layers.len() {
            let c = check.then_some(FiniteCheck { layer: i, ids });
            match self.run_layer(&self.layers[i], h, &mut state.layers[i], pos0, opts.verify, c, &mut traces) {
                Ok(out) => h = out,
                Err(e) => return Err(keep_failed(e, &mut traces, state)),
            }
            if let Some(n) = norms.as_mut() {
                n.push(HiddenStats::of(&h));
            }
        }
        let hidden = self.norm.forward(&h, self.precision);
        if check {
            finite::check(&hidden, None, Sublayer::FinalNorm, pos0, ids)
                .map_err(|e| keep_failed(e, &mut traces, state))?;
        }
        if let Some(n) = norms.as_mut() {
            n.push(HiddenStats::of(&hidden));
        }
        state.position += ids.len();
        let (logits, first) = match opts.logits {
            LogitsRows::All => (self.logits_of(&hidden)?, 0),
            LogitsRows::Last => (self.logits_of(&hidden.gather_rows(&[hidden.rows - 1]))?, ids.len() - 1),
        };
        if check {
            finite::check(&logits, None, Sublayer::LmHead, pos0 + first, &ids[first..])
                .map_err(|e| keep_failed(e, &mut traces, state))?;
        }
        Ok(ForwardOutput {
            logits,
            hidden_norms: norms,
            hidden,
            state_trace: traces.map(|layers| StateTrace { layers }),
        })
    }
}

/// Token ids within the vocabulary and `position + ids.len()` within the context, before
/// anything is computed (every device's model checks the same way).
pub(crate) fn validate_ids(config: &ModelConfig, ids: &[u32], position: usize) -> Result<()> {
    for (i, &id) in ids.iter().enumerate() {
        if id as usize >= config.vocab_size {
            return Err(Error::TokenOutOfRange { id, position: position + i, vocab_size: config.vocab_size });
        }
    }
    let needed = position + ids.len();
    if needed > config.max_position_embeddings {
        return Err(Error::ContextOverflow { needed, max: config.max_position_embeddings });
    }
    Ok(())
}
