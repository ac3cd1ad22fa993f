"""Device tracking: every value's device is decided by rules, never by running on the device.

`placement` holds the default rule (the common device of the inputs); `transfers` holds the
table of ops that choose or change the device themselves, filled by family: moves
(`transfers`), factories (`factories`), host values (`host_values`) and indexing (`indexing`).
The families are imported with the package `fxprop`, as the rule families are.
"""
from .placement import (CPU, META, configured_default_device, default_device, default_device_if_set, device_of,
                        logical_default_device, merge_devices, normalize_device, tag)
from .transfers import TRANSFERS, Placement, place

__all__ = ["CPU", "META", "Placement", "TRANSFERS", "configured_default_device", "default_device",
           "default_device_if_set", "device_of", "logical_default_device", "merge_devices", "normalize_device",
           "place", "tag"]
