//! deltascope: a terminal workbench for Gated-DeltaNet hybrid reasoning models (Qwen3.5 /
//! Qwen3.6, Qwen3-Next).
//!
//! Data flows one way: [`model`] (pure compute) → [`engine`] (sampling, budgets, phases) → one
//! event stream → front ends ([`cli`], [`tui`]).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod backend;
pub mod chat;
pub mod checkpoint;
pub mod cli;
pub mod devices;
pub mod engine;
pub mod error;
pub mod generation;
pub mod model;
pub mod server;
pub mod session;
pub mod tui;
pub mod units;
pub mod verify;

pub use error::{Error, Result};
