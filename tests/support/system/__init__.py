"""Support for the system tests (tests/system/): the product installed from its chart and watched."""
