"""Summarise an nvidia-smi sampling log (x2.sh plan k wrote one): for each GPU, over the samples in which it
was busy (power above ``--busy-watts``), how often the software power cap held its clocks (clock-event reason
bit 0x4) and what SM clock it ran at. Answers whether a step slowed down because the GPU hit its power limit.

    python scripts/device/smi_summary.py results/logs/h200-x2-s5/run1-log-smi.txt.gz
"""

from __future__ import annotations

import argparse
import gzip
import io

import pandas as pd

SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap


def load(path: str) -> pd.DataFrame:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    df = pd.read_csv(io.StringIO(text), skipinitialspace=True)
    df.columns = ["time", "gpu", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons"]
    for col, unit in (("sm_mhz", " MHz"), ("mem_mhz", " MHz"), ("power_w", " W")):
        df[col] = df[col].astype(str).str.replace(unit, "", regex=False).astype(float)
    df["reasons"] = df["reasons"].map(lambda x: int(str(x), 16))
    return df


def summarise(df: pd.DataFrame, busy_watts: float) -> pd.DataFrame:
    busy = df[df.power_w > busy_watts].copy()
    busy["power_capped"] = (busy.reasons & SW_POWER_CAP) != 0
    return busy.groupby("gpu").agg(
        busy_samples=("sm_mhz", "size"), power_capped_share=("power_capped", "mean"),
        sm_mhz_median=("sm_mhz", "median"), sm_mhz_min=("sm_mhz", "min"), sm_mhz_max=("sm_mhz", "max"),
        power_w_median=("power_w", "median"), power_w_max=("power_w", "max"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="nvidia-smi --format=csv log (optionally .gz)")
    ap.add_argument("--busy-watts", type=float, default=400.0, help="a sample above this power counts as busy")
    args = ap.parse_args()
    print(summarise(load(args.log), args.busy_watts).to_markdown(floatfmt=".4g"))


if __name__ == "__main__":
    main()
