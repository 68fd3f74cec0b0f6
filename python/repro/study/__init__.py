"""The seeds' cuDNN experiments on a PyTorch GPU, as commands (docs/studies.md, "PyTorch"):

- `cost`: what deterministic cuDNN costs each network (seed 004's figure 9), default against
  deterministic, in step time and GPU kernel time, with each mode's top kernels, whether two runs
  of each mode are bit-identical (recorded by `repro.torch`, compared by `repro diff`), where they
  first differ, and which ops refuse deterministic mode and what made the network run;
- `noise`: implementation noise (same seed, default cuDNN) against algorithmic noise (other
  seeds, deterministic) in trained classifiers (seeds 000 and 004): accuracy spread, churn and
  the distance between normalized weights, plus the first step where two IMPL runs part;
- `render`: the Markdown tables and SVG charts of a finished study directory.

    python -m repro.study cost  --models resnet50,vgg16,medium_cnn_k7 --out studies/cost
    python -m repro.study noise --models resnet18_cifar,small_cnn --runs 5 --out studies/noise

One module per concern: `models` (the networks), `modes` (default and deterministic, and the
workaround for ops that refuse), `step` (one training step, plain or recorded),
`timing` (step and kernel time), `twins` (two recorded runs and
their diff), `data` (the synthetic CIFAR-shaped set), `cost` and `noise` (the studies),
`published` (seed 004's own numbers), `report` (tables and charts).
"""
