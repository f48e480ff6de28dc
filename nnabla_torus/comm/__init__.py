"""The communicator and what moves the bytes: topology, collectives, backends, rendezvous."""
