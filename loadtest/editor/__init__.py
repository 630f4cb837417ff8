"""``make loadtest PROFILE=editor``: simulated typists, each pause a streamed completion
abandoned at the next keystroke, against two systems in mirrored windows (docs/editor-load.md);
:mod:`loadtest.editor.run` is the command line."""
