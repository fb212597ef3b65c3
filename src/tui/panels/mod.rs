//! The workbench's panels: each file holds one feature's state, keys and drawing.

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
