"""The reading tools (`verify`, `stats`, `head`, `inspect`, the image grid) over bundles and TFRecord files.

May import `reading`, `records`, `output`, `progress`, `images`, `files`, `errors`; never Beam.
"""
