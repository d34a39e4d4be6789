"""Sleeps 60 s; its arguments only mark its processes for a test to find them."""

import time

time.sleep(60)
