"""evaluation: metrics from summable counts, the literature's protocols, and crackseg evaluate.

May import crackseg.model, crackseg.cracks, crackseg.data, crackseg.core.
"""
