"""`python -m refllama`: the same as `python -m refllama.run` (generate text)."""

import sys

from .run import main

sys.exit(main())
