//! The workbench's panels: each file holds one feature's state, keys and drawing.

pub mod sliders;
pub mod state_scope;
