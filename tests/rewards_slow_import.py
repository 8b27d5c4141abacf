"""A reward module that takes IMPORT_SECONDS to import: a worker's start-up that is longer, by
construction, than the deadline a test gives each call."""
import time

from tests.rewards_for_tests import hangs_on_hang  # noqa: F401  (loaded by path, as a user would)

IMPORT_SECONDS = 4.0
time.sleep(IMPORT_SECONDS)
