"""``migrate`` pipeline: a torchvision-layout PyTorch ResNet into our MindSpore ResNet, with parity checks."""
