//! Socket options the relay needs that tokio does not offer: listeners that rebind
//! their port at once, a resizable accept backlog, and resets (SO_LINGER 0).

use std::{io, net::SocketAddr, time::Duration};

use socket2::{Domain, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

/// The backlog of a listener that is accepting normally.
pub const BACKLOG: i32 = 1024;

/// Binds a listener on `addr` with SO_REUSEADDR, so a proxy brought back up after
/// `down` gets its port again even while old connections sit in TIME_WAIT.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Sets the accept backlog of a listening socket. Linux takes a second `listen()` on a
/// listening socket as a new backlog and leaves the queue as it is.
pub fn set_backlog(listener: &TcpListener, backlog: i32) -> io::Result<()> {
    let backlog = nix::sys::socket::Backlog::new(backlog).map_err(io::Error::from)?;
    nix::sys::socket::listen(listener, backlog).map_err(io::Error::from)
}

/// Makes the next close of `stream` send RST instead of FIN, dropping unsent data.
pub fn reset_on_close(stream: &TcpStream) {
    // Failing here means the socket is already gone; there is nothing left to reset.
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// The same through another descriptor of the socket: its last close sends RST.
pub fn reset_fd_on_close(fd: &std::os::fd::OwnedFd) {
    let _ = SockRef::from(fd).set_linger(Some(Duration::ZERO));
}
