"""The network of sections 3 and 5: the Transformer (`model`) and its attention (`attention`), the
label-smoothed loss (`loss`), Adam with the warm-up learning rate (`optim`) and the numeric
precision training and search run in (`precision`). Imports data and the wings below."""
