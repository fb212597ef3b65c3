//! What the local engine is asked to run: the prompt's token ids and the protocol's parameters.

use deltascope_protocol::GenerationParams;

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub params: GenerationParams,
}
