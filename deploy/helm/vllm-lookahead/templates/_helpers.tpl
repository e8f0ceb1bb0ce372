{{/* Names and labels ------------------------------------------------------------------------ */}}

{{- define "vllm-lookahead.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vllm-lookahead.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of one component: fullname-<component>, within the 63-character limit. */}}
{{- define "vllm-lookahead.componentName" -}}
{{- printf "%s-%s" (include "vllm-lookahead.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component -}}
{{- end -}}

{{- define "vllm-lookahead.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vllm-lookahead.labels" -}}
helm.sh/chart: {{ include "vllm-lookahead.chart" . }}
{{ include "vllm-lookahead.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vllm-lookahead
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "vllm-lookahead.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-lookahead.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component; call with (dict "root" $ "component" "server"). */}}
{{- define "vllm-lookahead.componentLabels" -}}
{{ include "vllm-lookahead.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vllm-lookahead.componentSelectorLabels" -}}
{{ include "vllm-lookahead.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vllm-lookahead.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vllm-lookahead.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Images ---------------------------------------------------------------------------------- */}}

{{- define "vllm-lookahead.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "vllm-lookahead.sidecarImage" -}}
{{- printf "%s:%s" .Values.sidecar.image.repository (default .Chart.AppVersion .Values.sidecar.image.tag) -}}
{{- end -}}

{{/* Lookahead configuration (docs/CONTRACTS.md) ---------------------------------------------- */}}

{{- define "vllm-lookahead.speculativeConfig" -}}
{{- dict "model" "vllm_lookahead.LookaheadProposer" "num_speculative_tokens" (int .Values.lookahead.numSpeculativeTokens) | toJson -}}
{{- end -}}

{{/* The "lookahead" object: lookahead.extra (LookaheadConfig keys). */}}
{{- define "vllm-lookahead.lookaheadParams" -}}
{{- .Values.lookahead.extra | default dict | toJson -}}
{{- end -}}

{{- define "vllm-lookahead.additionalConfig" -}}
{{- printf "{\"lookahead\":%s}" (include "vllm-lookahead.lookaheadParams" .) -}}
{{- end -}}

{{/* Kafka ----------------------------------------------------------------------------------- */}}

{{- define "vllm-lookahead.kafkaURL" -}}
{{- printf "kafka://%s/%s" (join "," .root.Values.kafka.bootstrapServers) .topic -}}
{{- end -}}

{{- define "vllm-lookahead.kafkaUsesSASL" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol -}}true{{- end -}}
{{- end -}}

{{- define "vllm-lookahead.kafkaUsesTLS" -}}
{{- if and (has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL")) .Values.kafka.tls.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* The values checks ("vllm-lookahead.validate") live in _validate.tpl. */}}

{{/* Kafka auth environment with a given prefix (VLLM_LOOKAHEAD_ or QUALITY_SIDECAR_); values from Secrets only. */}}
{{- define "vllm-lookahead.kafkaAuthEnv" -}}
{{- $v := .root.Values -}}
- name: {{ .prefix }}KAFKA_SECURITY_PROTOCOL
  value: {{ $v.kafka.securityProtocol | quote }}
{{- if include "vllm-lookahead.kafkaUsesSASL" .root }}
- name: {{ .prefix }}KAFKA_SASL_MECHANISM
  value: {{ $v.kafka.sasl.mechanism | quote }}
- name: {{ .prefix }}KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.sasl.existingSecret }}
      key: {{ $v.kafka.sasl.usernameKey }}
- name: {{ .prefix }}KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.sasl.existingSecret }}
      key: {{ $v.kafka.sasl.passwordKey }}
{{- end }}
{{- if include "vllm-lookahead.kafkaUsesTLS" .root }}
- name: {{ .prefix }}KAFKA_SSL_CAFILE
  value: /etc/kafka-tls/{{ $v.kafka.tls.caKey }}
{{- end }}
{{- end -}}

{{/* OpenTelemetry ---------------------------------------------------------------------------- */}}

{{/* OTEL_* environment; call with (dict "root" $ "service" NAME "arm" ARM). */}}
{{- define "vllm-lookahead.otelEnv" -}}
{{- $o := .root.Values.telemetry.otel -}}
{{- $attrs := list "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" (printf "deployment.arm=%s" .arm) -}}
{{- range $k, $val := $o.resourceAttributes }}{{ $attrs = append $attrs (printf "%s=%v" $k $val) }}{{ end -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- if $o.enabled }}
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $o.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $o.protocol | quote }}
- name: OTEL_TRACES_EXPORTER
  value: otlp
- name: OTEL_METRICS_EXPORTER
  value: otlp
- name: OTEL_LOGS_EXPORTER
  value: none
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- else }}
- name: OTEL_SDK_DISABLED
  value: "true"
{{- end }}
{{- end -}}

{{/* Port of the OTLP endpoint (scheme://host:port); the protocol's default when absent. */}}
{{- define "vllm-lookahead.otlpPort" -}}
{{- $host := (urlParse .Values.telemetry.otel.endpoint).host -}}
{{- if contains ":" $host -}}
{{- last (splitList ":" $host) -}}
{{- else if eq .Values.telemetry.otel.protocol "grpc" -}}4317{{- else -}}4318{{- end -}}
{{- end -}}

{{/* Probes ---------------------------------------------------------------------------------- */}}

{{- define "vllm-lookahead.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
{{ toYaml .probe }}
{{- end -}}

{{/* Monitoring ------------------------------------------------------------------------------ */}}

{{/* "true" when Prometheus Operator kinds may be rendered: the CRDs are installed or the user says so. */}}
{{- define "vllm-lookahead.monitoringCRDs" -}}
{{- if or .Values.monitoring.skipCRDCheck (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}true{{- end -}}
{{- end -}}

{{/* Scrape targets: component, port name, whether it exists in this release. */}}
{{- define "vllm-lookahead.scrapeTargets" -}}
- component: server
  port: http
  enabled: true
- component: baseline
  port: http
  enabled: {{ .Values.baseline.enabled }}
- component: quality-sidecar
  port: metrics
  enabled: {{ .Values.sidecar.enabled }}
{{- end -}}
