"""A script with a typo in an import: the failure the restart policy calls a user error.

elastic-hydra script=examples/typo.py restart=on_failure   # exit 1, after one restart
"""

import transformerz  # noqa: F401  # the package is `transformers`: fails the same way every time
