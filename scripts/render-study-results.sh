#!/usr/bin/env bash
# Writes docs/results/studies-h100.md from the study reports in docs/results/studies-h100/
# (the JSON files `scripts/gpu-experiments.sh` brought back), with `repro study show`.
set -euo pipefail
cd "$(dirname "$0")/.."
R=${REPRO_BIN:-target/release/repro}
D=docs/results/studies-h100
table() { "$R" study show --markdown "$D/$1.json" | tail -n +2; }
{
cat <<'EOF'
# The studies on an NVIDIA H100

Made with `scripts/gpu-experiments.sh OUT 1000 studyfixtures cost devices-study noise-mlp`,
then `... noise-cnn` and `RESNET_RUNS=8 RESNET_EPOCHS=1 ... noise-resnet18` (each heading gives
the `repro study` command), on an NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0 (NVRTC),
repro 0.1.0 built with `make cuda`, 2026-11-21. The devices studies were run again, on a second
machine of the same kind, by the build that adds the train × eval table; their comparisons
(divergence, root cause, every ULP figure) came out identical to the first run's. The JSON reports and SVG charts are in
[studies-h100/](studies-h100/); the tables are `repro study show --markdown FILE.json` of those
files (`scripts/render-study-results.sh`). Each study ran once.

The binary that ran printed "control runs DIFFER" under the cnn and resnet18 tables: its test
compared the control runs' accuracy standard deviation with zero, and the mean of ten equal
accuracies rounds, leaving 2e-16. The JSON shows churn 0, L2 distance 0 and min = max for every
control variant; the verdict now rests on those and the tables below are rendered by the fixed
code.

EOF
cat docs/results/studies-h100-findings.md
cat <<'EOF'

## Noise: algorithmic vs implementation randomness

`control`: fixed seeds, ordered reductions; `algo`: seeds vary; `impl`: atomic reductions;
`algo+impl`: both (definitions: [../studies.md](../studies.md)).

### mlp on gauss2d (`repro study noise --workload mlp --device cuda:0 --runs 10`)
EOF
table noise-mlp
printf '\n![mlp noise](studies-h100/noise-mlp.svg)\n\n### cnn on digits (`repro study noise --workload cnn --device cuda:0 --runs 10`)\n'
table noise-cnn
printf '\n![cnn noise](studies-h100/noise-cnn.svg)\n\n### cnn with batch norm on digits (`repro study noise --workload cnn --batch-norm --device cuda:0 --runs 10`)\n'
table noise-cnn-bn
printf '\n![cnn with batch norm noise](studies-h100/noise-cnn-bn.svg)\n\n### resnet18 on cifar-synthetic (`repro study noise --workload resnet18 --device cuda:0 --runs 8 --epochs 1`)\n'
table noise-resnet18
printf '\n![resnet18 noise](studies-h100/noise-resnet18.svg)\n\n## CPU vs GPU\n\n### mlp on gauss2d (`repro study devices --workload mlp --devices cpu,cuda:0`)\n'
table devices-mlp-gauss2d
printf '\n![mlp gauss2d cpu vs gpu](studies-h100/devices-mlp-gauss2d.svg)\n\n### mlp on gauss5d (`repro study devices --workload mlp --dataset gauss5d --epochs 1 --devices cpu,cuda:0`)\n'
table devices-mlp-gauss5d
printf '\n### cnn on digits (`repro study devices --workload cnn --devices cpu,cuda:0`)\n'
table devices-cnn
printf '\n![cnn cpu vs gpu](studies-h100/devices-cnn.svg)\n\n## Cost of determinism (`repro study cost --device cuda:0 --steps 20 --rounds 3`)\n'
table cost
printf '\n![cost](studies-h100/cost.svg)\n'
} > docs/results/studies-h100.md
echo "wrote docs/results/studies-h100.md"
