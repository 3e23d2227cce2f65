"""Measured GPU usage of the prepared shares: sample NVML, map processes to shares, publish.

See :mod:`kubeletplugin.usage.sampler` for the loop and the documentation's "Measured usage".
"""
