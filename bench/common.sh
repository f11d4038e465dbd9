# Helpers shared by bench/run.sh and bench/callgrind.sh (sourced, not run).

# port_free PORT: nothing listens on 127.0.0.1:PORT yet. A server left over from something else
# would otherwise answer in place of the one a script starts (which then fails to bind).
port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# upstream_nginx_conf DIR PORT: the upstream every proxy row fronts (nginx `return 200 "ok"`
# on 127.0.0.1:PORT, one worker, no logging), written to DIR/nginx.conf.
upstream_nginx_conf() {
  local dir=$1 port=$2
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log stderr error;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:$port;
    location / { return 200 "ok"; }
  }
}
CONF
}
