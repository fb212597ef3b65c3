//! The `/v1/chat/completions` request body for one generation: the sampling sliders, every
//! value sent explicitly (what the workbench shows is what the server gets), and each server's
//! own thinking-budget field (serving-notes.md §4).

use serde_json::{Value, json};

use super::detect::{ServerFacts, ServerKind};
use crate::backend::{BackendError, BackendResult, BudgetMode, ChatRequest, Prompt, ReasoningSplit, RemoteSpec};
use deltascope_protocol::OnLoop;

pub fn chat_body(facts: &ServerFacts, req: &ChatRequest, spec: &RemoteSpec) -> BackendResult<Value> {
    let (budget_mode, split) = (spec.budget_mode, spec.reasoning_split);
    let messages = match &req.prompt {
        Prompt::Chat(m) => serde_json::to_value(m).map_err(|e| BackendError::invalid(format!("messages: {e}")))?,
        Prompt::Text(_) => {
            return Err(BackendError::invalid("--raw needs the local model (a server renders its own chat template)"));
        }
        Prompt::Ids(_) => return Err(BackendError::invalid("--prompt-ids needs the local model")),
        Prompt::Continue { .. } => {
            return Err(BackendError::invalid(
                "continuing a cut answer needs the local engine (a chat-completions server starts every answer afresh)",
            ));
        }
    };
    let p = &req.params;
    if p.answer_budget.is_some() {
        return Err(BackendError::invalid("--answer-budget needs the local engine (servers have no such field)"));
    }
    let mut body = json!({
        "model": facts.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": p.max_tokens,
        "chat_template_kwargs": {"enable_thinking": p.thinking.is_on()},
    });
    let o = body.as_object_mut().ok_or_else(|| BackendError::invalid("request body"))?;
    add_sampling(o, facts, req);
    // A client-side budget (or a loop's rescue) continues from the thinking's token ids, which servers send only
    // with logprob entries (llama.cpp: with at least one alternative; the frame mapper drops
    // alternatives nobody asked for).
    let client_budget = (budget_mode == BudgetMode::Client && p.thinking.budget().is_some())
        || (p.loop_detection.on_loop == OnLoop::Answer && p.thinking.is_on());
    if p.top_logprobs > 0 || client_budget {
        o.insert("logprobs".into(), json!(true));
        o.insert("top_logprobs".into(), json!(p.top_logprobs.max(usize::from(client_budget))));
    }
    match facts.kind {
        ServerKind::LlamaCpp => {
            // The split done server-side, per request, whatever --reasoning-format the server
            // was started with.
            let format = if split == ReasoningSplit::Server { "deepseek" } else { "none" };
            o.insert("reasoning_format".into(), json!(format));
        }
        ServerKind::Vllm if spec.token_ids && p.top_logprobs > 0 => {
            o.insert("return_tokens_as_token_ids".into(), json!(true));
        }
        ServerKind::Sglang => {
            if facts.speculative {
                o.insert("return_spec_tokens_details".into(), json!(true));
            }
            if split == ReasoningSplit::Client {
                o.insert("separate_reasoning".into(), json!(false));
            }
        }
        // deltascope serve reads SGLang's field.
        ServerKind::Deltascope if split == ReasoningSplit::Client => {
            o.insert("separate_reasoning".into(), json!(false));
        }
        _ => {}
    }
    if !p.stop_token_ids.is_empty() {
        match facts.kind {
            ServerKind::Vllm | ServerKind::Sglang | ServerKind::Deltascope => {
                o.insert("stop_token_ids".into(), json!(p.stop_token_ids));
            }
            k => {
                return Err(BackendError::invalid(format!("--stop-token-id: {} takes no stop token ids", k.name())));
            }
        }
    }
    if p.trace_state {
        return Err(BackendError::invalid(format!(
            "--trace-state: the state trace needs the in-process engine; {} does not expose a model's recurrent state",
            facts.kind.name()
        )));
    }
    if p.ignore_eos {
        // vLLM, SGLang, llama.cpp and deltascope all read this name.
        o.insert("ignore_eos".into(), json!(true));
    }
    if let (Some(budget), BudgetMode::Server) = (p.thinking.budget(), budget_mode) {
        match facts.kind {
            ServerKind::LlamaCpp => {
                // llama.cpp counts the newline after the prompt's `<think>` toward the budget
                // (b10566 and b11549 alike: a budget of 8 let the model write 7 tokens); one
                // more gives the model exactly the budget, as the engine does.
                o.insert("reasoning_budget_tokens".into(), json!(budget + 1));
                if !p.budget_bridge.is_empty() {
                    o.insert("reasoning_budget_message".into(), json!(p.budget_bridge));
                }
            }
            ServerKind::Vllm => {
                o.insert("thinking_token_budget".into(), json!(budget));
            }
            // Strict thinking (--enable-strict-thinking): exact, `</think>` only.
            ServerKind::Sglang => {
                o.insert("custom_params".into(), json!({"thinking_budget": budget}));
            }
            ServerKind::Deltascope => {
                o.insert("thinking_budget".into(), json!(budget));
                o.insert("reasoning_budget_message".into(), json!(p.budget_bridge));
            }
            ServerKind::Generic => {
                return Err(BackendError::invalid(
                    "--thinking-budget: this server has no known per-request budget field; use --budget-mode client (with --tokenizer DIR for the chat template)",
                ));
            }
        }
    }
    Ok(body)
}

/// The `/v1/completions` body that continues a client-forced end of thinking: the rendered
/// prompt, the thinking so far, the bridge and `</think>`, then the answer.
pub fn continuation_body(facts: &ServerFacts, req: &ChatRequest, prompt: Value, max_tokens: usize) -> Value {
    let mut body = json!({
        "model": facts.model,
        "prompt": prompt,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": max_tokens,
    });
    if let Some(o) = body.as_object_mut() {
        add_sampling(o, facts, req);
        // The legacy endpoint's `logprobs: N` (0 sends none).
        if req.params.top_logprobs > 0 {
            o.insert("logprobs".into(), json!(req.params.top_logprobs));
        }
    }
    body
}

/// The sampling settings and stop strings, every value explicit, in both request kinds.
fn add_sampling(o: &mut serde_json::Map<String, Value>, facts: &ServerFacts, req: &ChatRequest) {
    let p = &req.params;
    let s = &p.sampling;
    let fields = [
        ("temperature", json!(shortest(s.temperature))),
        ("top_p", json!(shortest(s.top_p))),
        ("top_k", json!(s.top_k)),
        ("min_p", json!(shortest(s.min_p))),
        ("presence_penalty", json!(shortest(s.presence_penalty))),
        ("frequency_penalty", json!(shortest(s.frequency_penalty))),
        ("repetition_penalty", json!(shortest(s.repetition_penalty))),
        ("seed", json!(s.seed)),
    ];
    for (k, v) in fields {
        o.insert(k.into(), v);
    }
    // llama.cpp's own name for the repetition penalty.
    if facts.kind == ServerKind::LlamaCpp {
        o.insert("repeat_penalty".into(), json!(shortest(s.repetition_penalty)));
    }
    if !p.stop.is_empty() {
        o.insert("stop".into(), json!(p.stop));
    }
}

/// An f32 setting as the decimal it was written as (0.8, not 0.800000011920929 — what the
/// sliders show is what the server gets).
fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}
