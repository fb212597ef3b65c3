//! deltascope's generation protocol: the tokenizer and chat templates, and what every backend
//! speaks (events, parameters with the one range table, controls, the Tally).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod chat;
pub mod generation;
