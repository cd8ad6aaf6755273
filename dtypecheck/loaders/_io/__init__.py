"""The machinery the format modules share: memory maps (``mapped``), the inert pickle VM (``pickle_vm``), the
judgement of pickle globals (``pickle_globals``), pickle side files (``pickle_files``) and torch's pickled objects
(``torch_objects``). Nothing here knows a checkpoint format."""
