"""Model folders (ours and the official layout), the published checkpoints and their pins,
the OWT Lightning imports, and exact parity with the official implementation."""
