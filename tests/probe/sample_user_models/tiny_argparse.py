"""A training script that parses arguments at import: argparse exits under autotune."""

import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args([])


def make_workload() -> None:
    return None
