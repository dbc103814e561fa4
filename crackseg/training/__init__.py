"""training: loaders, seeds, augmentation, losses, the step math, the run folder, and fit(config).

May import crackseg.evaluation, crackseg.model, crackseg.data, crackseg.core.
"""
