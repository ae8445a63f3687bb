"""The contracts between the core and its plugins: what each kind of plugin registers or
implements."""
