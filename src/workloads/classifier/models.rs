//! The classifier architectures: the poster's MLP, the paper's three-layer small CNN, and a
//! CIFAR-style ResNet-18. Each maps a batch of examples to logits, recording every layer.

use super::layers::{dropout, max_pool, relu, BatchNorm, Conv, Ctx, Linear, Node, ParamStore};
use crate::record::RecordError;
use std::fmt;
use std::str::FromStr;

/// Which architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelKind {
    /// One hidden layer of 26 ReLU units.
    #[default]
    Mlp,
    /// Three [conv 3×3, (batch norm), ReLU, 2×2 max pool] blocks of 16, 32 and 32 channels, a
    /// dense layer of 32 units and the output layer.
    Cnn,
    /// ResNet-18 for 32×32 inputs: a 3×3 stem, four stages of two basic blocks (`width`,
    /// 2×, 4×, 8× channels), global average pooling and the output layer.
    ResNet18,
}

impl ModelKind {
    /// The workload name of each architecture.
    pub fn workload_name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::ResNet18 => "resnet18",
        }
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.workload_name())
    }
}

impl FromStr for ModelKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mlp" => Ok(ModelKind::Mlp),
            "cnn" => Ok(ModelKind::Cnn),
            "resnet18" => Ok(ModelKind::ResNet18),
            _ => Err(format!("unknown model `{s}`: expected mlp, cnn or resnet18")),
        }
    }
}

/// Hidden units of the MLP (the poster's 26).
pub const MLP_HIDDEN: usize = 26;

/// A built network.
pub enum Model {
    /// See `ModelKind::Mlp`.
    Mlp { fc1: Linear, fc2: Linear },
    /// See `ModelKind::Cnn`.
    Cnn { blocks: Vec<(Conv, Option<BatchNorm>)>, fc1: Linear, fc2: Linear },
    /// See `ModelKind::ResNet18`.
    ResNet18 { stem: (Conv, BatchNorm), blocks: Vec<BasicBlock>, fc: Linear },
}

/// A ResNet basic block: two 3×3 convolutions with batch norm, and a shortcut.
pub struct BasicBlock {
    name: String,
    conv1: Conv,
    bn1: BatchNorm,
    conv2: Conv,
    bn2: BatchNorm,
    /// A 1×1 convolution and batch norm where the shape changes.
    shortcut: Option<(Conv, BatchNorm)>,
}

impl Model {
    /// Creates the parameters of `kind` for examples of `example_shape` and `classes` classes.
    pub fn new(
        kind: ModelKind,
        p: &mut ParamStore,
        example_shape: &[usize],
        classes: usize,
        batch_norm: bool,
        width: usize,
    ) -> Result<Model, RecordError> {
        let unsupported = |what: &str| RecordError::Unsupported(format!("{kind} needs {what} examples"));
        match kind {
            ModelKind::Mlp => {
                let inputs = example_shape.iter().product();
                Ok(Model::Mlp {
                    fc1: Linear::new(p, "fc1", inputs, MLP_HIDDEN)?,
                    fc2: Linear::new(p, "fc2", MLP_HIDDEN, classes)?,
                })
            }
            ModelKind::Cnn => {
                let &[channels, side, _] = example_shape else { return Err(unsupported("image")) };
                let mut blocks = Vec::new();
                let mut cin = channels;
                for (i, cout) in [16, 32, 32].into_iter().enumerate() {
                    let conv = Conv::new(p, &format!("conv{}", i + 1), cin, cout, 3, 1, 1, !batch_norm)?;
                    let bn = if batch_norm { Some(BatchNorm::new(p, &format!("bn{}", i + 1), cout)?) } else { None };
                    blocks.push((conv, bn));
                    cin = cout;
                }
                let side = side / 8;
                Ok(Model::Cnn {
                    blocks,
                    fc1: Linear::new(p, "fc1", 32 * side.max(1) * side.max(1), 32)?,
                    fc2: Linear::new(p, "fc2", 32, classes)?,
                })
            }
            ModelKind::ResNet18 => {
                let &[channels, _, _] = example_shape else { return Err(unsupported("image")) };
                let stem = (Conv::new(p, "conv1", channels, width, 3, 1, 1, false)?, BatchNorm::new(p, "bn1", width)?);
                let mut blocks = Vec::new();
                let mut cin = width;
                for stage in 0..4 {
                    let cout = width << stage;
                    for b in 0..2 {
                        let stride = if stage > 0 && b == 0 { 2 } else { 1 };
                        blocks.push(BasicBlock::new(p, &format!("layer{}.{b}", stage + 1), cin, cout, stride)?);
                        cin = cout;
                    }
                }
                Ok(Model::ResNet18 { stem, blocks, fc: Linear::new(p, "fc", cin, classes)? })
            }
        }
    }

    /// Logits for a batch `x` (`[batch, features]` or `[batch, c, h, w]`).
    pub fn forward(&self, ctx: &mut Ctx, x: &Node) -> Result<Node, RecordError> {
        match self {
            Model::Mlp { fc1, fc2 } => {
                let h = fc1.forward(ctx, x)?;
                let h = relu(ctx, "relu1", &h)?;
                let h = dropout(ctx, "dropout1", 0, &h)?;
                fc2.forward(ctx, &h)
            }
            Model::Cnn { blocks, fc1, fc2 } => {
                let mut h = x.clone();
                for (i, (conv, bn)) in blocks.iter().enumerate() {
                    h = conv.forward(ctx, &h)?;
                    if let Some(bn) = bn {
                        h = bn.forward(ctx, &h)?;
                    }
                    h = relu(ctx, &format!("relu{}", i + 1), &h)?;
                    h = max_pool(ctx, &format!("pool{}", i + 1), &h)?;
                }
                let flat = ctx.op("flatten", &[&h.name], h.t.flatten_from(1)?)?;
                let h = fc1.forward(ctx, &flat)?;
                let h = relu(ctx, "relu4", &h)?;
                let h = dropout(ctx, "dropout4", 3, &h)?;
                fc2.forward(ctx, &h)
            }
            Model::ResNet18 { stem, blocks, fc } => {
                let h = stem.0.forward(ctx, x)?;
                let h = stem.1.forward(ctx, &h)?;
                let mut h = relu(ctx, "relu1", &h)?;
                for block in blocks {
                    h = block.forward(ctx, &h)?;
                }
                let pooled = ctx.op("avgpool", &[&h.name], h.t.mean((2, 3))?)?;
                fc.forward(ctx, &pooled)
            }
        }
    }
}

impl BasicBlock {
    fn new(p: &mut ParamStore, name: &str, cin: usize, cout: usize, stride: usize) -> Result<Self, RecordError> {
        let shortcut = if stride != 1 || cin != cout {
            Some((
                Conv::new(p, &format!("{name}.shortcut.conv"), cin, cout, 1, stride, 0, false)?,
                BatchNorm::new(p, &format!("{name}.shortcut.bn"), cout)?,
            ))
        } else {
            None
        };
        Ok(BasicBlock {
            name: name.into(),
            conv1: Conv::new(p, &format!("{name}.conv1"), cin, cout, 3, stride, 1, false)?,
            bn1: BatchNorm::new(p, &format!("{name}.bn1"), cout)?,
            conv2: Conv::new(p, &format!("{name}.conv2"), cout, cout, 3, 1, 1, false)?,
            bn2: BatchNorm::new(p, &format!("{name}.bn2"), cout)?,
            shortcut,
        })
    }

    fn forward(&self, ctx: &mut Ctx, x: &Node) -> Result<Node, RecordError> {
        let h = self.conv1.forward(ctx, x)?;
        let h = self.bn1.forward(ctx, &h)?;
        let h = relu(ctx, &format!("{}.relu1", self.name), &h)?;
        let h = self.conv2.forward(ctx, &h)?;
        let h = self.bn2.forward(ctx, &h)?;
        let skip = match &self.shortcut {
            Some((conv, bn)) => {
                let s = conv.forward(ctx, x)?;
                bn.forward(ctx, &s)?
            }
            None => x.clone(),
        };
        let sum = ctx.op(&format!("{}.add", self.name), &[&h.name, &skip.name], (&h.t + &skip.t)?)?;
        relu(ctx, &format!("{}.relu2", self.name), &sum)
    }
}
