# errors.pxi -- the one exception class, and CHKERR, which turns a
# coll_result_t into it with the text the core wrote where the error was born.

class CollectivesError(RuntimeError):
    """A collective failed: a peer died, disagreed, sent garbage, or timed out.

    Exposed as ``collectives.MPI.Exception``. ``error_code`` is the core's
    ``coll_result_t``; the message names this rank, the peer, the collective
    and both sides' values where they differ.
    """

    def __init__(self, error_code: int = 2, message: str = None, error_class: int = None) -> None:
        if message is None:
            message = f"MPI error class {int(error_code)}"
        super().__init__(message)
        self.error_code = int(error_code)
        self.error_class = int(error_code if error_class is None else error_class)

    def Get_error_code(self) -> int:
        """The core's result code (mpi4py name)."""
        return self.error_code

    def Get_error_class(self) -> int:
        """MPI's error class (collectives.MPI.ERR_*): the code, unless the refusing call
        named a class (ERR_TYPE, ERR_OP, ERR_COMM...)."""
        return self.error_class

    def Get_error_string(self) -> str:
        """The message (mpi4py name)."""
        return str(self)


ERR_NAMES = {
    COLL_INVALID_ARGUMENT: "INVALID_ARGUMENT",
    COLL_INVALID_USAGE: "INVALID_USAGE",
    COLL_SYSTEM_ERROR: "SYSTEM_ERROR",
    COLL_REMOTE_ERROR: "REMOTE_ERROR",
    COLL_TIMEOUT: "TIMEOUT",
    COLL_INTERNAL_ERROR: "INTERNAL_ERROR",
    COLL_CUDA_ERROR: "CUDA_ERROR",
}


cdef int CHKERR(coll_result_t res, const coll_comm_t *comm) except -1:
    if res == COLL_SUCCESS:
        return 0
    text = coll_comm_last_error(comm).decode("utf-8", "replace") if comm != NULL else ""
    if not text:
        text = coll_strerror(res).decode()
    if res == COLL_INVALID_ARGUMENT:
        raise ValueError(text)
    raise CollectivesError(<int>res, text)
