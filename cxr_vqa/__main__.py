"""`python -m cxr_vqa`: the `cxr-vqa` command."""

import sys

from cxr_vqa.cli import main

sys.exit(main())
