"""Token sequences for language-model training: ``packed`` (documents' tokens packed into
fixed-length rows, exact under resume).

Imports: the standard library, torch and ``asyncloader._base``; nothing else of asyncloader.
"""
