//! A gated MLP's weights: a dense layer's MLP, and each expert of a mixture ([`crate::moe`]).

use ferrite_formats::Matrix;

/// A gated MLP's weights: `down(act(gate(x) + b_gate) * (up(x) + b_up)) + b_down`.
#[derive(Debug, Clone)]
pub struct Ffn {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    /// gpt-oss's experts' biases; `None` for every other family.
    pub bias: Option<Box<FfnBias>>,
}

/// An MLP's biases (this rank's rows of gate's and up's).
#[derive(Debug, Clone)]
pub struct FfnBias {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// On rank 0 only: the ranks' partial sums of down's output are added up after it.
    pub down: Option<Vec<f32>>,
}

impl Ffn {
    pub fn matrices(&self) -> [&Matrix; 3] {
        [&self.gate, &self.up, &self.down]
    }

    pub fn matrices_mut(&mut self) -> [&mut Matrix; 3] {
        [&mut self.gate, &mut self.up, &mut self.down]
    }
}
