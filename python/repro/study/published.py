"""Seed 004's own numbers for its figure 9, as its text states them (section 4): deterministic GPU
kernel time relative to default, as a ratio (the paper's "185%" is 1.85). The figure's other bars
are in its image only, which the seed's text does not carry; these are all the values it gives."""

# (network, GPU) → ratio, for the networks the text names with a value.
NETWORKS = {("vgg19", "V100"): 1.85, ("mobilenet", "V100"): 1.01}

# GPU → (lowest, highest) ratio over the ten networks.
NETWORK_RANGES = {"P100": (1.01, 2.11), "V100": (1.01, 1.85), "T4": (1.01, 1.96)}

# GPU → (ratio at kernel 1×1, ratio at 7×7) of the six-layer medium CNN; the text says the ratio
# grows with the kernel size on every GPU.
MEDIUM_CNN = {"P100": (2.84, 7.46), "V100": (1.29, 2.41), "T4": (1.17, 1.96)}

GPUS = ("P100", "V100", "T4")
