"""`python -m onnx_quant` runs the CLI."""

import sys

from onnx_quant.cli import main

sys.exit(main())
