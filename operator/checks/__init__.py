"""What is checked before anything is built: the administrator's policy, advice, mounted certificates and
the Secrets a resource names."""
