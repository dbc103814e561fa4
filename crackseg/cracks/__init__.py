"""cracks: cracks measured from masks (ids, length, widths, width classes) and their centrelines for GIS, styled for QGIS.

No torch. May import crackseg.core.
"""
