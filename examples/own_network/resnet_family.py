"""A ResNet-like family: stages of residual blocks whose depth, width and kernel are searched."""
from torch import nn


class Residual(nn.Module):
    def __init__(self, channels: int, kernel: int):
        super().__init__()
        pad = kernel // 2
        self.body = nn.Sequential(nn.Conv2d(channels, channels, kernel, padding=pad, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU(),
                                  nn.Conv2d(channels, channels, kernel, padding=pad, bias=False),
                                  nn.BatchNorm2d(channels))

    def forward(self, x):
        return nn.functional.relu(x + self.body(x))


def resnet_family(trial, stages: int = 2):
    stem = trial.suggest_categorical("stem_width", [8, 16])
    layers = [nn.Conv2d(trial.in_channels, stem, 3, padding=1, bias=False),
              nn.BatchNorm2d(stem), nn.ReLU()]
    channels = stem
    for s in range(stages):
        width = trial.suggest_categorical(f"stage{s}_width", [16, 24, 32])
        layers += [nn.Conv2d(channels, width, 3, stride=2 if s else 1, padding=1, bias=False),
                   nn.BatchNorm2d(width), nn.ReLU()]
        for b in range(trial.suggest_int(f"stage{s}_blocks", 1, 3)):
            layers.append(Residual(width, trial.suggest_categorical(f"stage{s}_block{b}_kernel",
                                                                    [3, 5])))
        channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, trial.num_classes))
