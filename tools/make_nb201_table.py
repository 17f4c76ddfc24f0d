"""Build frugalnas/data/nb201_accuracy.npz from ../shared/data/nats_bench.csv.

The table is indexed by the cell's op indices read as a base-5 number (edge order
1<-0, 2<-0, 2<-1, 3<-0, 3<-1, 3<-2; op order as in frugalnas.spaces.nb201.space.OPS).
Usage: python tools/make_nb201_table.py [path/to/nats_bench.csv]
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from frugalnas.spaces.nb201.space import NB201Space

src = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/nats_bench.csv")
df = pd.read_csv(src)
space = NB201Space()
acc = np.full((15625, 3), np.nan, dtype=np.float32)
for row in df.itertuples(index=False):
    idx = space.index(space.parse(row.ArchitectureString))
    acc[idx] = (row.CIFAR10TestAccuracy200Epochs, row.CIFAR100TestAccuracy200Epochs,
                row.ImageNetTestAccuracy200Epochs)
assert not np.isnan(acc).any(), "table is incomplete"
out = Path(__file__).resolve().parents[1] / "frugalnas" / "data" / "nb201_accuracy.npz"
np.savez_compressed(out, test_accuracy=acc, columns=np.array(["cifar10", "cifar100", "imagenet16-120"]))
print(f"wrote {out} ({out.stat().st_size} bytes)")
