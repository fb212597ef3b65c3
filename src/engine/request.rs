//! What a generation request asks for.

use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GenerationParams {
    /// Thinking + answer tokens, as the servers count them.
    pub max_tokens: usize,
    /// 0 = greedy.
    pub temperature: f32,
    pub seed: u64,
}

impl Default for GenerationParams {
    fn default() -> Self {
        GenerationParams { max_tokens: 512, temperature: 0.0, seed: 0 }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub params: GenerationParams,
}
