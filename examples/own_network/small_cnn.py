"""A user's own network as a search space: depth, widths and kernel sizes of a small CNN."""
from torch import nn


def small_cnn(trial, max_depth: int = 4):
    layers, channels = [], trial.in_channels
    for i in range(trial.suggest_int("depth", 1, max_depth)):
        width = trial.suggest_categorical(f"width{i}", [8, 16, 32])
        kernel = trial.suggest_categorical(f"kernel{i}", [3, 5])  # asked only when layer i exists
        layers += [nn.Conv2d(channels, width, kernel, padding=kernel // 2),
                   nn.BatchNorm2d(width), nn.ReLU()]
        channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, trial.num_classes))
