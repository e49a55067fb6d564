"""The suite tests the language on the reference interpreter (its definition) unless a test
asks for a device; the backends' own tests compare them with it."""
import os

os.environ.setdefault("DSLC_DEVICE", "reference")

from hypothesis import settings

# Property tests check values, not speed (a slow shared machine must not fail them); tests
# that promise a time, like the front end's fuzz test, set their own deadline.
settings.register_profile("dslc", deadline=None)
settings.load_profile("dslc")
