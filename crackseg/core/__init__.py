"""core: what every room shares: user errors, atomic files, locks, options and their checks, the page shell, the version.

May import nothing of crackseg, and no torch.
"""
