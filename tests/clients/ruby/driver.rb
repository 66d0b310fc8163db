# Dalli 3.0 (Debian's ruby-dalli, binary protocol) driven by the matrix: reads
# driver-protocol requests on stdin (see tests/clients/driver.py), answers one
# line each. Usage: ruby driver.rb HOST PORT
require 'dalli'
require 'logger'

# Dalli logs to stdout by default; stdout carries the driver protocol.
Dalli.logger = Logger.new($stderr)

host, port = ARGV
server = "#{host}:#{port}"
# socket_timeout defaults to 1 s: a get q/t=5000 would be cut short, and the
# server marked down for down_retry_delay (30 s).
mc = Dalli::Client.new(server, socket_timeout: 10, compress: false)
$stdout.sync = true

def unhex(text)
  [text.to_s].pack('H*')
end

def value(data)
  "value #{data.to_s.unpack1('H*')}"
end

answer = lambda do |op, args|
  case op
  when 'set'
    # raw: true stores the bytes as they are (flags 0) instead of a Marshal dump
    mc.set(unhex(args[0]), unhex(args[1]), 0, raw: true) ? 'ok' : 'error set returned false'
  when 'get'
    data = mc.get(unhex(args[0]))
    data.nil? ? 'none' : value(data)
  when 'stat'
    data = (mc.stats[server] || {})[unhex(args[0])]
    data.nil? ? 'none' : value(data)
  when 'delete'
    mc.delete(unhex(args[0])) ? 'ok' : 'error delete returned false'
  when 'flush_all'
    mc.flush.all? ? 'ok' : 'error flush returned false'
  when 'version'
    value(mc.version[server])
  when 'quit'
    mc.close
    'ok'
  else
    "error unknown request #{op}"
  end
end

$stdin.each_line do |line|
  op, *args = line.chomp.split(' ')
  reply = begin
    answer.call(op, args)
  rescue StandardError => e
    "error #{e.class}: #{e.message.tr("\n", ' ')}"
  end
  puts reply
  break if op == 'quit'
end
