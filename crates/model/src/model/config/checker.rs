//! One object of config.json being checked (the top level, `text_config`, a rope dict): its
//! path for the errors, and the range checks every field goes through. Below the checks
//! themselves (check.rs, keys.rs, rope.rs), which all read their fields through it.

use super::raw::{Field, Ids};
use crate::error::{Error, Result};

/// A field's name and its value: `at!(t.head_dim)` is `("head_dim", &t.head_dim)`.
macro_rules! at {
    ($raw:ident . $field:ident) => {
        (stringify!($field), &$raw.$field)
    };
}
pub(super) use at;

/// The largest size or count a config may give (2^24).
pub(super) const MAX_SIZE: usize = 1 << 24;

/// The checks on the fields of one object of the file (the top level, `text_config`, a rope
/// dict): `prefix` is the object's path (`text_config.`), `file` names the file.
pub(super) struct Checker<'a> {
    pub file: &'a str,
    pub prefix: String,
}

impl Checker<'_> {
    pub(super) fn path(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    pub(super) fn error(&self, key: &str, message: impl Into<String>) -> Error {
        Error::field(self.file, &self.path(key), message)
    }

    pub(super) fn usize_opt(&self, (key, f): (&str, &Field<usize>)) -> Result<Option<usize>> {
        match f.present() {
            None => Ok(None),
            // Every size and count in these configs is far below this (the largest, a 1M-token
            // context, is 2^20): a larger one is a corrupt file, not a model, and sizing memory
            // from it would abort the process instead of refusing it.
            Some(Ok(n)) if *n > MAX_SIZE => {
                Err(self
                    .error(key, format!("{n} is larger than any model's (at most {MAX_SIZE}): is the file corrupt?")))
            }
            Some(Ok(n)) => Ok(Some(*n)),
            Some(Err(v)) => Err(self.error(key, format!("expected a non-negative integer, found {v}"))),
        }
    }

    pub(super) fn usize_or(&self, field: (&str, &Field<usize>), default: usize) -> Result<usize> {
        Ok(self.usize_opt(field)?.unwrap_or(default))
    }

    pub(super) fn positive_or(&self, field: (&str, &Field<usize>), default: usize) -> Result<usize> {
        let n = self.usize_or(field, default)?;
        if n == 0 {
            return Err(self.error(field.0, "must be greater than 0"));
        }
        Ok(n)
    }

    /// A size every checkpoint's config sets: absent, the class default would not match the
    /// weights and loading would fail later on a shape, far from the cause.
    pub(super) fn positive_required(&self, field: (&str, &Field<usize>), class_default: usize) -> Result<usize> {
        if self.usize_opt(field)?.is_none() {
            return Err(self.error(
                field.0,
                format!(
                    "missing (transformers would take its class default {class_default}, which the weights' shapes would then contradict)"
                ),
            ));
        }
        self.positive_or(field, class_default)
    }

    pub(super) fn f64_opt(&self, (key, f): (&str, &Field<f64>)) -> Result<Option<f64>> {
        match f.present() {
            None => Ok(None),
            Some(Ok(x)) => Ok(Some(*x)),
            Some(Err(v)) => Err(self.error(key, format!("expected a number, found {v}"))),
        }
    }

    /// A norm epsilon: finite and > 0 (≤ 0 makes `rsqrt(mean(x²) + eps)` NaN or ±Inf for small
    /// activations, and the model emits garbage from the first layer on).
    pub(super) fn eps_or(&self, field: (&str, &Field<f64>), default: f64) -> Result<f64> {
        let eps = self.f64_opt(field)?.unwrap_or(default);
        if !(eps.is_finite() && eps > 0.0) {
            return Err(self.error(field.0, format!("must be a small positive number (typically 1e-6), found {eps}")));
        }
        Ok(eps)
    }

    pub(super) fn bool_opt(&self, (key, f): (&str, &Field<bool>)) -> Result<Option<bool>> {
        match f.present() {
            None => Ok(None),
            Some(Ok(b)) => Ok(Some(*b)),
            Some(Err(v)) => Err(self.error(key, format!("expected true or false, found {v}"))),
        }
    }

    pub(super) fn str_opt<'f>(&self, (key, f): (&str, &'f Field<String>)) -> Result<Option<&'f str>> {
        match f.present() {
            None => Ok(None),
            Some(Ok(s)) => Ok(Some(s.as_str())),
            Some(Err(v)) => Err(self.error(key, format!("expected a string, found {v}"))),
        }
    }

    pub(super) fn ids_opt(&self, (key, f): (&str, &Field<Ids>)) -> Result<Vec<u32>> {
        match f.present() {
            None => Ok(vec![]),
            Some(Ok(Ids::Many(list))) => list
                .iter()
                .map(|id| {
                    id.element()
                        .map(|n| *n as u32)
                        .map_err(|v| self.error(key, format!("expected token ids, found {v}")))
                })
                .collect(),
            Some(Ok(Ids::One(n))) => Ok(vec![*n as u32]),
            Some(Err(v)) => Err(self.error(key, format!("expected a token id or a list of ids, found {v}"))),
        }
    }
}
