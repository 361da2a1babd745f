"""Images: headers read over a batch, whole-image checks, reading image files, image columns as written.

May import `files`, `errors` and `arrays`.
"""
