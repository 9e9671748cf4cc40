"""Masked language modelling configs: the LION BERTs of paper Sec. 5.2 (C4 pre-training, M2
recipe) and small runs on the embedded corpus for the length-extrapolation check."""
