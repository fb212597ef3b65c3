//! The workbench's panels: each file holds one feature's state, keys and drawing behind the
//! one contract of `tui/panel.rs`. A panel imports the screen's shared words (`screen.rs`),
//! the contract, the message log and the drawing helpers (`wrap.rs`, `popup.rs`), never the
//! `App` nor the frame's composition (`view/`), which sit above it.

pub mod compare;
pub mod composer;
pub mod gauges;
pub mod help;
pub mod inspector;
pub mod messages;
pub mod picker;
pub mod sliders;
pub mod state_scope;
pub mod transcript;
