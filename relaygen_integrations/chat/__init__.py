"""Framework-free chat layer shared by the engine and both adapters: prompt rendering and tool-call parsing."""
