//! The rotary embedding's settings: transformers' priority is the `rope_parameters` (or legacy
//! `rope_scaling`) dict, then the flat field, then the default (theta 10000,
//! partial_rotary_factor 0.25 for these models).

use super::RopeConfig;
use super::checker::{Checker, at};
use super::raw::{RawRope, RawTextConfig};
use crate::error::{Error, Result};

pub(super) fn rope_config(f: &Checker, t: &RawTextConfig, head_dim: usize) -> Result<RopeConfig> {
    let (dict_key, dict): (&str, Option<&RawRope>) = match (t.rope_parameters.present(), t.rope_scaling.present()) {
        (Some(Ok(o)), _) => ("rope_parameters", Some(&o.0)),
        (_, Some(Ok(o))) => ("rope_scaling", Some(&o.0)),
        (Some(Err(v)), _) => return Err(f.error("rope_parameters", format!("expected an object, found {v}"))),
        _ => ("rope_parameters", None),
    };
    let inner = Checker { file: f.file, prefix: format!("{}{}.", f.prefix, dict_key) };
    let theta = match dict.map(|d| inner.f64_opt(at!(d.rope_theta))).transpose()?.flatten() {
        Some(theta) => theta,
        None => f.f64_opt(at!(t.rope_theta))?.unwrap_or(10_000.0),
    };
    let partial_rotary_factor = match dict.map(|d| inner.f64_opt(at!(d.partial_rotary_factor))).transpose()?.flatten() {
        Some(p) => p,
        None => f.f64_opt(at!(t.partial_rotary_factor))?.unwrap_or(0.25),
    };
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
        return Err(f.error("partial_rotary_factor", format!("{partial_rotary_factor} is not in (0, 1]")));
    }
    let rope_type = match dict {
        Some(d) => {
            inner.str_opt(at!(d.rope_type))?.or(inner.str_opt(("type", &d.kind))?).unwrap_or("default").to_string()
        }
        None => "default".to_string(),
    };
    if rope_type != "default" {
        return Err(Error::Unsupported {
            file: f.file.to_string(),
            message: format!(
                "{}rope_type: \"{rope_type}\" is not supported yet (only \"default\"; YaRN is only needed beyond 262,144 tokens)",
                inner.prefix
            ),
        });
    }
    let rotary_dim = (head_dim as f64 * partial_rotary_factor) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(f.error(
            "partial_rotary_factor",
            format!("gives a rotary dimension of {rotary_dim} for head_dim {head_dim}; it must be even and positive"),
        ));
    }
    // The whole numbers of the list; anything else in it is skipped.
    let mrope_section = match dict.map(|d| d.mrope_section.present()) {
        Some(Some(Ok(list))) => Some(list.iter().filter_map(|n| n.element().ok()).map(|&n| n as usize).collect()),
        _ => None,
    };
    let mrope_interleaved = match dict {
        Some(d) => inner.bool_opt(at!(d.mrope_interleaved))?.unwrap_or(false),
        None => false,
    };
    Ok(RopeConfig { rope_type, theta, partial_rotary_factor, rotary_dim, mrope_section, mrope_interleaved })
}
