"""``inferwatch gpu analyze``: recorded nvidia-smi and allocator logs replayed through the live detector."""
