"""cracks: cracks measured from masks (ids, length, widths, width classes) and their centrelines for GIS.

No torch. May import crackseg.core.
"""
