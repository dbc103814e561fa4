"""core: what every room shares: user errors, atomic files, locks, options and their checks, the page shell, the version,
files in object storage.

May import nothing of crackseg, and no torch.
"""
