"""The suite tests the language on the reference interpreter (its definition) unless a test
asks for a device; the backends' own tests compare them with it."""
import os

os.environ.setdefault("DSLC_DEVICE", "reference")
