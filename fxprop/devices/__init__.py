"""Device tracking: every value's device is decided by rules, never by running on the device.

`placement` holds the default rule (the common device of the inputs); `transfers` holds the
table of ops that choose or change the device themselves.
"""
from .placement import (META, default_device, device_of, logical_default_device, merge_devices,
                        normalize_device, tag)
from .transfers import TRANSFERS, Placement, place

__all__ = ["META", "Placement", "TRANSFERS", "default_device", "device_of", "logical_default_device", "merge_devices",
           "normalize_device", "place", "tag"]
