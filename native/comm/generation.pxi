# generation.pxi -- the communicator generation in every message header (coll.h:
# coll_comm_set_generation), numbered by the elastic layer (collectives/elastic/membership.py).


def comm_set_generation(Communicator comm, unsigned int generation) -> None:
    """Set the generation carried in every header of comm (a communicator made directly,
    before its first message; equal on every rank): a message of another generation is
    refused by the receiver, naming both."""
    cdef coll_result_t res = coll_comm_set_generation(comm._live(), generation)
    if res == COLL_INVALID_ARGUMENT:
        raise ValueError("a subcommunicator carries its root's generation: set it there")
    if res != COLL_SUCCESS:
        raise CollectivesError(<int>res, "the generation of a communicator is set before its "
                               "first message, not after")


def comm_generation(Communicator comm) -> int:
    """The generation in comm's message headers (its root's; 0 unless set)."""
    return coll_comm_generation(comm._live())
