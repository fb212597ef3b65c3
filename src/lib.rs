//! deltascope: a terminal workbench for Gated-DeltaNet hybrid reasoning models (Qwen3.5 /
//! Qwen3.6, Qwen3-Next).
//!
//! Data flows one way: `deltascope-model` (pure compute) → `deltascope-protocol` (the events
//! every backend speaks) and `deltascope-engine` (sampling, budgets, MTP) → this crate's
//! backends → its front ends ([`cli`], [`tui`], [`server`], [`verify`]).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod backend;
pub mod cli;
pub mod exit;
pub mod server;
pub mod session;
pub mod tui;
pub mod verify;
