"""Convert checkpoints written before robo_rl's checkpoints were safe to open, in place:

    python scripts/upgrade_checkpoint.py runs/lift/RUN/checkpoints/step_00002000.pt [more.pt ...]

Older checkpoints pickled numpy RNG states and simulator snapshots, which `torch.load(weights_only=True)`
refuses; this loads each one unrestricted (it may run code: convert only files you trust) and rewrites it with
tensors and plain values only (robo_rl/checkpoint.py), atomically.
"""
import argparse

from robo_rl.checkpoint import upgrade_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="step_*.pt files to rewrite in the safe format")
    for path in parser.parse_args().checkpoints:
        upgrade_checkpoint(path)
        print(f"{path}: upgraded")


if __name__ == "__main__":
    main()
